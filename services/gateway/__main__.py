from services.gateway.main import main

# Guarded: the tokenizer's worker process imports this module again when it starts.
if __name__ == "__main__":
    main()
