from services.worker.cli import main

main()
