"""``python -m gan_accel.cli``: the same as the ``gan-accel`` command."""

import sys

from . import main

sys.exit(main())
