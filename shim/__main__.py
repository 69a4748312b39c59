import sys

from shim.cli import main

sys.exit(main())
