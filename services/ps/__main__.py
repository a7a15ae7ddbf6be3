from zmqflow.services.ps.cli import main

main()
