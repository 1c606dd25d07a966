from orphan_cleanup.cli import main

raise SystemExit(main())
