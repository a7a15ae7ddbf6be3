from zmqflow.services.serve.cli import main

main()
