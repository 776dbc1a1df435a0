from scaletrain.train.cli import main

raise SystemExit(main())
