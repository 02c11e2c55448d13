from bench.gpu_check.main import main

raise SystemExit(main())
