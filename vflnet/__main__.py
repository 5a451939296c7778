import sys

from vflnet.cli import main

sys.exit(main())
