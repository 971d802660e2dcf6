"""containerd's shim v2 for ParaCell: one resident process per pod serving the Task API over ttrpc.
"""
