"""The NumPy engine's speed on the CPU, behind gpt2.py: how each weight matrix is laid out for the products
(layouts.py, with the panel layouts of panels.py) and each product split over the cores (threads.py). NumPy
only. Nothing here runs unless asked: gpt2.GPT2Model multiplies the checkpoint's arrays as they are, and a
program opts into the fast layouts (main.py and bench/ do); the numbers then are the same dot products.
"""
