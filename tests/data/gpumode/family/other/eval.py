raise SystemExit("not run")
