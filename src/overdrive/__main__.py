from overdrive.cli import main

raise SystemExit(main())
