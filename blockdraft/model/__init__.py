"""The draft network and the functional target forward that the decode loop drives."""
