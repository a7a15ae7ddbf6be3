from services.reader.cli import main

main()
