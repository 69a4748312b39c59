import sys

from shim.cli.main import main

sys.exit(main())
