"""An experiment's data: the text corpus checked, tokenized and cut into shards (:mod:`.text`, :mod:`.upload`,
:mod:`.tokenizer`, :mod:`.builtin`); an archive of images checked member by member (:mod:`.archive`), its labels
(:mod:`.labels`), decoded and cut into shards (:mod:`.images`) and attached to its experiment (:mod:`.image_data`);
and the training data and checkpoints served to workers (:mod:`.training_data`)."""
