import sys

from bcr_core.cli import main

sys.exit(main())
