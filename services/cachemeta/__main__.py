from services.cachemeta.main import main

main()
