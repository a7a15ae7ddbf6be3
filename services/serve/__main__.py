from services.serve.cli import main

main()
