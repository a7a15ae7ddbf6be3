from zmqflow.services.gateway.cli import main

main()
