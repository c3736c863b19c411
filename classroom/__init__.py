"""The classroom: `lossless.check_lossless(decoder)`, a statistical check that any decoder with
speculative_sampling's signature samples exactly the target's distribution (lossless.py); twelve bugs from
public implementations kept as small patches of sampling.py and gpt2.py, which the checker must catch
(bug_zoo.py, notebook 7); `exact_law.check_exact(decoder)`, the exact sibling of the statistical check,
which runs the decoder along every path of its random choices on small tables (exact_law.py, with the
symbolic random numbers of symbolic.py); the verifiers' bugs, patches of verifiers/ that the exact check
catches where the statistical one cannot, and Medusa's typical acceptance, lossy by design (verifier_zoo.py);
the drafters' bugs, EAGLE's residual at the rejected token only, which both checks catch, and wiring mistakes of the
drafters made from the target, patches of drafters/ that stay exact and can only change acceptance (drafter_zoo.py);
the automatic checks of notebook 9's exercises
(exercise_checks.py); models that record each call's time and KV-cache work (calls.py), for notebook 3's timeline
of a run (timeline.py); and the page that replays one run in a browser, loop by loop (trace.py, page.py, page/).
It uses only gpt2.py's and sampling.py's public pieces and the verifiers and drafters it checks.
"""
