"""The NumPy engine's speed on the CPU, behind gpt2.py: how each weight matrix is laid out for the products
(layouts.py, with the panel layouts of panels.py), which layouts this machine multiplies fastest (measure.py,
kept per machine by plan_cache.py) and each product split over the cores (threads.py). NumPy only. Nothing here
runs unless asked: gpt2.GPT2Model multiplies the checkpoint's arrays as they are, and a program opts in with
`engine.fast_model(params, hparams)` (main.py and bench/ do); the numbers then are the same dot products.
"""

from engine.model import fast_model, lay_out, layout_plan  # noqa: F401 (the engine's entry points)
