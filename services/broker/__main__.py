from zmqflow.services.broker.cli import main

main()
