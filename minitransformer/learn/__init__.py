"""The build-it-yourself track (`minitransformer learn`): exercises/NN_name.py are the engine's functions with their
bodies taken out; track.py checks a learner's file against the engine's own function and then runs it inside the
real model or engine. One module per exercise (ex01_bpe.py, ex02_rms_norm.py, ...), found in order by
track.exercises()."""
