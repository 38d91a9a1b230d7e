"""`python -m trainer.launch`: the `trainer-launch` command."""

import sys

from trainer.launch.launcher import main

sys.exit(main())
