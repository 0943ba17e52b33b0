import sys

from gmlake.cli import main

sys.exit(main())
