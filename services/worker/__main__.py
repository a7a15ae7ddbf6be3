from zmqflow.services.worker.cli import main

main()
