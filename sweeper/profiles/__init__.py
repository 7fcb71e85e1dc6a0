"""Measured machine profiles: the file `sweep profile` writes (`profile`), where a user's are kept
(`cache`), what `profile show` prints of one (`profile_show`) and its tables read as seconds for
any shape (`lookup`, with `MeasuredProfile`, the profile a cluster carries). Pure.

Below the sweep file: a cluster names its profile, and the models price from it.

May import: foundation.
"""
