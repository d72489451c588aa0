from crescent.cli import main

raise SystemExit(main())
