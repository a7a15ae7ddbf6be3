from zmqflow.services.aggregator.cli import main

main()
