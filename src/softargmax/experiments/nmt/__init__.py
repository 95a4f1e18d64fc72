"""Neural machine translation pieces shared by the experiments: data, tokenizer, model, training, decoding; and the
translation experiment's plan of runs, results, verdicts on the paper's claims, report and figures."""
