from services.tierd.main import main

main()
