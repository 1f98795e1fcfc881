"""Current names, no warnings of ours: DDP's buffer switch by its current name, the launch in words.

torch 2.13 renamed DDP's ``broadcast_buffers`` to ``forward_sync_buffers`` and warns (FutureWarning) at
every wrap that gets the old name; Accelerate 1.16's ``DistributedDataParallelKwargs`` still only has the
old field. The quickstart's first line used to print Accelerate's raw enum ("NO on cpu").
"""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedDataParallelKwargs, DistributedType, KwargsHandler

from gan_accel import TrainConfig, build_accelerator
from gan_accel.engine import launch
from gan_accel.engine.launch import ddp_kwargs, ddp_takes, describe_launch

DEPRECATED = ("broadcast_buffers", "forward_sync_buffers")


def test_ddp_gets_the_buffer_switch_by_its_current_name():
    handler = ddp_kwargs()
    fields = {f.name for f in dataclasses.fields(DistributedDataParallelKwargs)}
    if "forward_sync_buffers" in fields:  # an Accelerate that knows the new name
        assert handler.forward_sync_buffers is False and handler.to_kwargs() == {"forward_sync_buffers": False}
    elif ddp_takes("forward_sync_buffers"):  # torch renamed it, Accelerate (1.16) not yet: the handler passes it on
        assert handler.broadcast_buffers is True  # the old name stays at its default: never passed to DDP
        assert handler.to_kwargs() == {"forward_sync_buffers": False}
        handler.find_unused_parameters = True  # a field set later still reaches DDP
        assert handler.to_kwargs() == {"find_unused_parameters": True, "forward_sync_buffers": False}
    else:  # a torch before the rename
        assert handler.to_kwargs() == {"broadcast_buffers": False}


def test_each_version_gets_the_name_it_has(monkeypatch):
    monkeypatch.setattr(launch, "ddp_takes", lambda argument: False)  # torch before 2.13
    assert ddp_kwargs().to_kwargs() == {"broadcast_buffers": False}

    @dataclasses.dataclass
    class NewerKwargs(KwargsHandler):  # an Accelerate with the new field
        broadcast_buffers: bool = True
        forward_sync_buffers: bool | None = None

    monkeypatch.setattr(launch, "DistributedDataParallelKwargs", NewerKwargs)
    handler = ddp_kwargs()
    assert isinstance(handler, NewerKwargs) and handler.to_kwargs() == {"forward_sync_buffers": False}


def test_the_accelerator_gan_accel_builds_takes_the_handler(tmp_path):
    accelerator = build_accelerator(TrainConfig(output_dir=str(tmp_path), progress_bar=False))
    assert accelerator.ddp_handler is not None
    assert accelerator.ddp_handler.to_kwargs() == ddp_kwargs().to_kwargs()
    assert describe_launch(accelerator) == "1 process on cpu"


@pytest.mark.skipif(not ddp_takes("forward_sync_buffers"), reason="this torch predates forward_sync_buffers")
def test_wrapping_with_the_handler_warns_nothing_and_syncs_no_buffers(tmp_path):
    """The kwargs reach a real DDP (one gloo process): no FutureWarning, and no buffer sync in forward. The old
    name, for contrast, warns: the test would notice a return to it."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped = DistributedDataParallel(model, **ddp_kwargs().to_kwargs())
        assert not [w for w in caught if any(name in str(w.message) for name in DEPRECATED)], caught
        assert wrapped.forward_sync_buffers is False
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            DistributedDataParallel(model, broadcast_buffers=False)
        assert any("broadcast_buffers" in str(w.message) for w in caught)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("kind, n, backend, device, says", [
    (DistributedType.NO, 1, None, "cpu", "1 process on cpu"),
    (DistributedType.NO, 1, None, "cuda:0", "1 process on cuda:0"),
    (DistributedType.MULTI_CPU, 2, "gloo", "cpu", "2 processes (DDP, gloo) on cpu"),
    (DistributedType.MULTI_CPU, 2, "gloo", "cpu:0", "2 processes (DDP, gloo) on cpu"),  # a DDP process's CPU device
    (DistributedType.MULTI_GPU, 8, "nccl", "cuda:0", "8 processes (DDP, nccl) on cuda:0"),
    (DistributedType.DEEPSPEED, 4, "nccl", "cuda:0", "4 processes (DeepSpeed, nccl) on cuda:0"),
    (DistributedType.FSDP, 2, "nccl", "cuda:0", "2 processes (FSDP, nccl) on cuda:0"),
])
def test_the_launch_in_words(kind, n, backend, device, says):
    accelerator = SimpleNamespace(num_processes=n, distributed_type=kind, state=SimpleNamespace(backend=backend),
                                  device=torch.device(device))
    assert describe_launch(accelerator) == says
