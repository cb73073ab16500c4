from spark_outbox.cli.main import main

raise SystemExit(main())
