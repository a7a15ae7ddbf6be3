from services.aggregator.cli import main

main()
