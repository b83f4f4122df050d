import sys

from inferq.cli.main import main

sys.exit(main())
