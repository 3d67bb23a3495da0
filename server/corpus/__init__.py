"""An experiment's data: the text corpus checked, tokenized and cut into shards (:mod:`.text`, :mod:`.upload`,
:mod:`.tokenizer`, :mod:`.builtin`), and the training data and checkpoints served to workers
(:mod:`.training_data`)."""
