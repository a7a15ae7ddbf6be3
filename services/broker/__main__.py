from services.broker.cli import main

main()
