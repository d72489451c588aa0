from services.kvindex.main import main

main()
