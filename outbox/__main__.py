from outbox.cli import main

raise SystemExit(main())
