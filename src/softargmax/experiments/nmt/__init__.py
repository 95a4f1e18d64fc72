"""Neural machine translation pieces shared by the experiments: data, tokenizer, model, training, decoding."""
