from zmqflow.services.reader.cli import main

main()
