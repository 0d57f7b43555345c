"""`python -m trainopt_core.distributed --nproc N -- ...`: the launch CLI (see `launch`)."""
import sys

from .launch import main

sys.exit(main())
