import sys

from lanes._cli import main

sys.exit(main())
