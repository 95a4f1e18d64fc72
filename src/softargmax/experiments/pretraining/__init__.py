"""Language-model pretraining pieces of ``softargmax reproduce lm``: the decoder, the data, the training, the metrics
and the gradient with respect to a learned reference measure; and the experiment's plan of runs, its jobs, samples
and cost measurements, results, plateau criterion, paired test and verdicts, figures and report."""
