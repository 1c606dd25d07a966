from orphan_cleanup.cli.app import main

raise SystemExit(main())
