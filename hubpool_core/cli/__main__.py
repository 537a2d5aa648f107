from hubpool_core.cli.main import main

main()
