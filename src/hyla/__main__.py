from hyla.cli import main

raise SystemExit(main())
