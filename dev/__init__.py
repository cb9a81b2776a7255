"""Developer tools that work on the source tree (outside the installed package): `python -m dev.docs`
regenerates the README's and the documentation's generated tables and plots from the definitions and results/."""
