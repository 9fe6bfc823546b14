"""Data: the upstream puzzle format (puzzle_format), Grain sources (puzzle_source, text_source)
and the builders (``python -m data.sudoku | data.maze | data.arc | data.shakespeare_char |
data.openwebtext``). Importing this package imports nothing heavy; import the submodules."""
