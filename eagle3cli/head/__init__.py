"""What a head folder means, in one place: `table.py` (every config field and tensor, where each
layout writes it and where each engine reads it), `folder.py` (the folder parsed: config, layout,
safetensors header, aux ids and norms read as the engines read them), `check.py` (the one check,
`problems(head, target, engine)`), `read.py` (the one reader: `read_head`, `load_head`), `write.py`
(the one writer: train's RUN/head, export's layouts) and `engines.py` (which engine serves which
target, and which EAGLE-3.1 norms it reads). Asked by eval, export, serve and train's --init-head."""
