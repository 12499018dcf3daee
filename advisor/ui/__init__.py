"""What every command is made of, built-in or brought by a backend (a third-party plugin too): the
flags in llama.cpp's vocabulary and the request they make (flags.py), the one output sink (output.py),
a plan on the screen and its files (show.py, chart.py), a table of many models (listing.py)."""
