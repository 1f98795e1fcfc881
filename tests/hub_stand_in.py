"""A stand-in for the Hugging Face Hub: ``huggingface_hub``'s network calls (HfApi.create_repo and upload_folder,
the mixin's too, and snapshot_download) on a local folder, recorded; everything else, the mixin included, is the
real library. The real Hub is never reached from the tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import huggingface_hub
import huggingface_hub.hub_mixin
import pytest


class StandInHub:
    """Repos as folders under ``root``; ``calls``: what was asked of the Hub, in order."""

    def __init__(self, root: Path) -> None:
        self.root, self.calls = root, []
        hub = self

        class HfApi:
            def __init__(self, token=None):
                hub.calls.append(("HfApi", {"token": token}))

            def create_repo(self, repo_id, repo_type="model", private=False, exist_ok=False, **_):
                hub.calls.append(("create_repo", {"repo_id": repo_id, "repo_type": repo_type or "model",
                                                  "private": private, "exist_ok": exist_ok}))
                (hub.root / repo_id).mkdir(parents=True, exist_ok=exist_ok)
                return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

            def upload_folder(self, folder_path, repo_id, repo_type=None, commit_message=None, **_):
                hub.calls.append(("upload_folder", {"repo_id": repo_id, "repo_type": repo_type}))
                shutil.copytree(folder_path, hub.root / repo_id, dirs_exist_ok=True)
                return f"https://huggingface.co/{repo_id}/commit/1"

        def snapshot_download(repo_id, revision=None, token=None, repo_type=None, allow_patterns=None):
            hub.calls.append(("snapshot_download", {"repo_id": repo_id, "allow_patterns": allow_patterns}))
            if not (hub.root / repo_id).is_dir():
                raise OSError(f"404 Client Error: Repository Not Found for url: https://huggingface.co/{repo_id}")
            return str(hub.root / repo_id)

        self.HfApi, self.snapshot_download = HfApi, snapshot_download

    @classmethod
    def installed(cls, root: Path, monkeypatch: pytest.MonkeyPatch) -> "StandInHub":
        """A stand-in on ``root`` in ``huggingface_hub``'s place until ``monkeypatch`` undoes it."""
        hub = cls(root)
        for module in (huggingface_hub, huggingface_hub.hub_mixin):
            monkeypatch.setattr(module, "HfApi", hub.HfApi)
        monkeypatch.setattr(huggingface_hub, "snapshot_download", hub.snapshot_download)
        return hub
