from ksearch_graph.cli.main import main

raise SystemExit(main())
