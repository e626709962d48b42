import sys

from gatherwise.cli import main

sys.exit(main())
