from paraplan.cli.app import main

main()
