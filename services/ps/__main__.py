from services.ps.cli import main

main()
