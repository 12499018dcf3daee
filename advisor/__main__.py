import sys

from kvadvise.cli import main

sys.exit(main())
