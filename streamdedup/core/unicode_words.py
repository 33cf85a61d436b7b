"""Which code points are not word characters (letters, marks, numbers), stored per Unicode version.

Normalization cuts texts at every other code point. Working that out asks
``unicodedata`` for the category of all 1,114,112 code points, about 0.15 s
that every process pays at its first non-ASCII text: the deciding process
and the preparing one, each at start, while the first batches wait
(measured: 4-5% of a 30,000-line ``dedup``). The answer for the Unicode
versions of the Pythons we support is stored below, and checked against the
computed one by the tests; another version is worked out as before.

``python streamdedup/core/unicode_words.py`` stores the running Python's
version (it needs nothing but the standard library, so any Python will do).
"""

from __future__ import annotations

import base64
import re
import struct
import sys
import unicodedata
import zlib
from itertools import accumulate
from typing import Optional

__all__ = ["non_word_ranges", "stored_non_word_ranges", "computed_non_word_ranges"]

# unidata_version -> the non-word ranges' bounds (first, last, first, last, ...), as deltas (uint32
# little-endian), zlib-compressed, base64. Written by ``_store``.
STORED = {
    "13.0.0": (
        "eNqdWDtsXEUUffO++97zrteOvV5/1mtbrJ2fk8g4zgeCg/lZ2MFCIoCgoCGA5EREiFDRABJCCGgokEhBFUpoKCJRRSg0NBRBlBH0"
        "FDRICCkwozlXPrl6ayOvNJqd3713zv3OC4IgOG5baVtq26RtCfpjtoWYjwL/C9FkHKNvo59B/5Pxe+poKVpIdJq2vYOx22vAW9YT"
        "2h/TvPuNon8O/Sfov0G/AHpC57BtGe7EdCLVh9g3hbkE/wcgwwbmX8f+HHxKjEeI76BtD2P8GnA4hfMh7TPQwZBtHaw7fsu2tUD3"
        "gG0FMHO/9yv4sjyC5xjma0p/CdYLtT/B/UXHgkuK9Tr6jOQP6B6ip4zOV8kRVfRML1XnY5I9VXaSAruC+BfKbvrxTxWOMfUiT4Pw"
        "KkGjpvbvhbvmp3GPsRb3wb0kejmti65EjkT5J9t5SL3gWcdcWkHHKD+sA4sB9FX+P4S9uVpPVByJ0RjXjPBKCNcqPmUFnv34cdxJ"
        "FJ5Rn/ssq7HoZgjnRwh/3ncAvMaVHYp/1FQMzZSecshYkn04+R4Cjybdf75Czyn6cTXfBr1UzWeEh/h/F+stioGj6hz3EeHZw3iU"
        "8JB5uftpxFFHdwt8F4heTHgdxfwz5n791ZQcMn9YjeeC/3dOcD2r5h8n/6zhXiHswMX3FygeuvkroR8Pg84kzm5ifQA6aJA/F8C6"
        "AP2ywh4F44vKfiLSn9hNk+KXzL8Evkex9hRsTfK1xIE65g+RvTi5FrEu9YG7xwOUr86DzjTODZA8A5RXHS6P2HaB7tQED/f/Gvoz"
        "2F/i7BL5udxD9DJIOB3E/38wnjL356sFlb/yXexa6hm3b6VPHo1pnvOq5L8GxTrZ9xbpLcOa4NXAXeeAS6jqhVLxT1WdFFbYdwD6"
        "4t8xxUbZ5+LLL3ZwDrpx+eta6GPBtj1wAvuk/xC0Crr7bn58huJwA/GJ8+h++1mqU+8Yz7NN/pySHUfkr5GqV14mvGKKO6+QXnPw"
        "k1qtC310yI6aND+P8apldMteeNX+v/esp/eZZbIGWk6OhvHzHcTMZZXn3oa/Sd3wBtml+MUhnIvIPjLIdhK0xO8lLozT3oD8rIc9"
        "01hbQ2wQO5W4cRq6GFTxpo1zT8OWJB4NkT5y8kPuq+xC9DEI+u+qulH43jji/7ex5u4TWaW9iTiwTbmopLxeB72GyqP93glXgMFl"
        "4+/0KOQ4BR+QeCp5wvWrRPcjxMKqd1eBeB32wUfsdo7knlTvgIjs0UCGWeBWwmdK5Lsm9l8Fz/dI70vAROK8YNclP4kxNpT/c8LR"
        "2eVXSk89ohdhTwY7ve7syng+Y6Dl2hcV745FVd9KvJF6Z4biUgZsjyucBEvJb08gXkkd484/qPbrunSa9CJ5rUV+MguM5FyXatNB"
        "2E2O+xq8OWPI0wLmW/CnFfi5vBFT3EnyZc/s8D1SUf9fILznYWsSd9rgtQ6sutD/OWA2AX6ixxWKUxG9H3ukJ0fvSVpnPwsJ54Lq"
        "xXnKa+f71G2BqodTvLdjki/Zx/ssUPW3Ue/BhPJbTdX17vzHqPdihUsH8Ze/M7j1G9C/oVowg82skV1LjdSD34oeTsJeDPmyiws/"
        "AI9X8Z2kJBxCVf9EZJccV4VnCb/I6XuFPj8BXWV0vw2Sf1bkNjvvomP0TmrAjziejFHcX6/Q16LKXxHRy8gOMrU+r8YZ42m8H9yk"
        "eqWFt8V1e+ASYqXD+rZt31tmJ6zQP1sh1+2Bm/aiZ0NPb4bs6RLdS+pqyZ8J4cx22QIezve+tTRfRO7fhOxiB8PIL5ynCrKFv8f8"
        "HX+Nve+7tb9s0JsxvqaTt6Vg9an7fmeVexlrDbLBlOpyR//2yE5tl1HNIX7RAd3PQetL+Ps2bMbVks9D7vWK70Gm4vtgXcUDwWtN"
        "vd9ytd5R8SNV9bTsu4h6YQLjCfV9c7/jnPLJv8brP8I4o+8sITBKKc5tJTvyDav3LMevO1QTc10mOeCq8fV+Yun9SHXZQfUua0U+"
        "fujvKhvkt06uW4TnVMX3VM7XpcI/rPjeG+3ynon3oL9Xr88lyj6SPvKVhHusvgvJ/GOh95PfC8Qdu+nu1z7urTS979wF3w9aXs9L"
        "1iCnbSLv2rO/WaabNgF+90cR/Ol0dy8M/gMR0XeZ"
    ),
    "14.0.0": (
        "eNqdWDtsHEUY3tnn7e29bOK7s53z2VbOTuI4iUziOIbIjglgYQdTkICgACFekhOBEKGiASSEENDQQUEVSmgo3KaAhoYiiBKCRDoK"
        "ShpgRvv93JefvTPySaO5mfnnf79mPc/zTtmR2RHbMWlHhPmkHT72Ay//+RiyDjG3MU9j/t7kMFWMGMMnPA073sLawRrQlvOI4EPa"
        "d78xzE9i/gjzV5jngU/wHLcjgUyMJ1CzD7jD2IvwvwIetrD/CuBT0MmwPkR063Y8iPXL0MM53PcJzsAGI3Z0cC70xoHX8VQCffd7"
        "t4Au8yP6bGG/pOwX4bys4CPQEhuLXmKcVzEnxL9HcoTEbzCEj6BgZnyxuh8S77Hykxi6KxP9svKbQfRjpceQZuGnRvrKgKOk4PfT"
        "u6an9R7iLByg94zwpXQuthI+IhWf7Oc+zaLPKvbiAjxGxWEVuqhgLor/EZLPU/hilTfY/1m/CektIv0W0csK9DqIbkT0I6XXYIBc"
        "Z9RabCRyHiI7MNx9kG1c+aPIW1K5NFH2SsFjRn7i+HsANBok/1yBvWPM42q/DXyx2k9IH2KPLs6bpL8xdY/ngPTZw3qM9CH7IvsK"
        "8pnDuwO684QvJH2dwP7j5l77lRQfsn9crWe9/3dP9Lqq9i9RnJYglw8/cHn+KcqLbv+6n69HgWcSd7dxXoENWsDXgo+MQYfaD0W3"
        "V5TfBGQ38ZcG3atg/xnQO4GzR+FjUq8lD1Sxf4z8xPG1iHPpDxzeI1Sv1oFnCvcqxE+F6qqjd9rZEXvCbxn/b2A+D/gMcEsU3yKH"
        "2KNO8h7F/5Z/b52aV3UrHeLH0sc4uOUB9TOkfa6nUvdqgGG4N8heCc5ETzXIOAt9+KpPyBT9WPVHfoE/i/0lnkPKhQLn8smPdnHB"
        "zpfhhzf8PPZ37YW7uFsmWYfF6XmqJTXkH66XB51nqB+9bXKabYrXmPw1oHgMVF/yLOknpLzyHNkxBT3pybrQf4f8pkH7c1ivWUK3"
        "rMBr9v8nVz1vAzgc/ZrJ8XeQC8+o+vUm4kn6glcxX6SeQOf3luonJcYcj2eBW+Jc8sM4wXoUVz3ATOFsA7lA/FPyxApsUld5p417"
        "j4Evqe8jZJeU4o/nIv8Qu9SB/23VJwrdmwv5/zbOnDyBNd5rJofbpZqTUf2uAl9N1ctB74Lr0ME1k8t0EXycQyxI/pR64OY1wvsB"
        "akHRO6uM/OwP0I/47yzxPan6/oD80oCHGegtQ+xkqGsNwL8Omu+Q3ZegE8nrorsuxUuItaE6n5IeXe34QtmpR/gCwCTkpxXiv6hv"
        "HnbufHXF9OtoitGivmqB+rBLBe+XRdUnSz6Tfmma8l4CPKeU/sVGUicfRj6UPsjdv1/B6752iuwtNb9J8TcD3cu9LvXvdfijyG7w"
        "dg3BTxN620GcLiMPVTDHkEnqbs/06S4UvCMukx1dDpwA3WOU59qguQmdiT9doDpRwd2Y/GWZ8mNA79Ie2c3heYTOOZ590nuZ+s85"
        "qpvrA/pAT/XXMd7xIfEXHeDd56l+3qh3UET1tKTeCe7+h+gfQ6WXDvI8f79w5zfhD9I3NXE2g5gRP5feq4f8IHY4C/8xlDMkzzm+"
        "9qCXF/EdJiN9+KrPCshfOY8L7QzxktL3EH1/AjZLSM4tkmMEfh2b/nvrJMV9DfHF+atFdWazwG6Lql4GhC8hf0jU+ZxaJ6xXk8fF"
        "HvVJTbxZPrcXXkJudjr/1sloib0AuNOW+R8ss5v24p415Kqf450m/3L8PKHWXdXPSx2PSP/st03oyeW3ry2Np9GTbEMm8ZNR1Dmu"
        "l2XylT9buew/hXlecGd3Z/vxo/V9xPRrTIN0+7H7nmid4RrOauS7Mb0THJ7nR/v+4/Tc8fu5JqEeSeKrAzqfAvdnyBu78Ln37bgK"
        "/jYLvleZgu+XVZVXRM4N9a5M1XlH5aFY9f0CdwX9zQTWE+r760HXKdWpv03uJwHWCX0H8qGjmPLlTpjj+4X4HFXvbc6Ht6mn535S"
        "asw66k8D75Tfwv9+FwpUvv6O+s6jqFH/1tEgz1f6+9AW5QmH5xbhP1zwfZj7hkzx4xd8vw6GvNPCffDvN+t7Oq6iAfxlZJ9Qfd+S"
        "/Yf8PM5+LSOPWKA7X+a5ZLWRw/4Muu81c79Ysg48ZQt61969Y4lu28L7ze9l7w9n47987x/gX3eZ"
    ),
    "15.0.0": (
        "eNqdWDtsXEUUfTPvt7tvf3bi3bWd9dpW1k7sOAGTOE5C5MQEsGKDKUhAUPARPymJghChQDSAhBACGkoKqiDRQJs2BTS0QVQIBYn0"
        "lDTAjN657MnlrY280mh2Zu7c/29eEATBMTcyNxI3Jt2IMR91w2I/DPKfxZB1hLmDeRrzjyaHqWEkGJbwNN14B2sPa0BbzmOCj2jf"
        "/8YwP435U8zfYp4HPsGz4EYKmRhPqGYLuAPYi/G/Ch42sf864Mugk2G9n+g23HgY69egh5O4bwnOwAYjbnRxLvTGgdfzVAJ9//ug"
        "gC7zI/psY7+k7BfjvKLgY9ASG4teEpzXMKfEf0ByRMRvuAMfYcHM+BJ1PyLeE+UnCXRXIfoV5TfD6CdKjxHNwk+d9JUBR0nB76Z3"
        "TU/rPcJZNETvGeEr07nYSviIVXyyn1uaRZ817CUFeIyKwxp0UcVcFP8jJF+g8CUqb7D/s35T0ltM+i2ilxXodRjdmOjHBXbPCuQ6"
        "rtZiI5FzP9mB4fZBtnHljyJvSeXSVNmrDB4z8hOv9zOg0ST55wrsnWAeV/sd4EvUfonwiT16OG+R/sbUPZ5D0mcf6zHSh+yL7KvI"
        "Zx7vNujOE76I9HUE+0+a++1XUnzI/oJazwb/757o9bTav0BxWoJcFn7g8/wzlBf9/jWbr0eBZxJ3t3BehQ3awNeGj4wN8UPR7SXl"
        "NyH5sfhLk+5Vsf8c6B3B2ePwManXkgdq2D9MfuL5WsK59Ace70GqV+eAZwr3qsRPleqqp/eAtyP2hN8K/t/AfArwGeCWKb5FDrFH"
        "g+Q9hP9te3+dmld1q7yDH0sf4+FWhtTPiPa5nkrdqwOG4d4ie6U4Ez3VIeMs9GFVn5Ap+onqj2yBP4v9JZ4jyoUC5/PJT25x1s1P"
        "wA9v2Dz2r7gL93C3QrLuFKenqJbUkX+4Xu51nqF+9I7JaXYoXhPy15DiMVR9yfOkn4jyygtkxzLoSU/Wg/675DdN2p/Des0Ruu0E"
        "XnP/P78cBOvA4enXTY6/i1x4XNWvtxFP0he8gfk89QQ6v7dVPykx5nk8AdwS55Ifxgk2oLjqA2YKZ+vIBeKfkidWYZOGyjsd3LsI"
        "vqS+j5BdyhR/PBf5h9ilAfzvqT5R6N5czP93cOblCZ3xrpsc7grVnIzqdw346qpeDnsXXIMOrppcpvPg4yRiQfKn1AM/rxHej1EL"
        "it5ZFeRnO0Q/4r+zxPek6vtD8ksDHmagtwyxk6GuNQH/Jmi+T3Zfhk4kr4vuehQvEdaG6nyZ9Ohrx1fKTn3CFwImJT+tEv9FffNO"
        "595XV82gjpYx2tRXLVIfdqHg/bKk+mTJZ9IvTVPeS4HnmNK/2Ejq5KPIh9IH+fsPKXjd106RvaXmtyj+ZqB7udej/r0BfxTZDd6u"
        "EfhpQW/biNMV5KEq5gQySd3tmwHdxYJ3xEX4Q4ocOAG6hynPdUBzAzoTfzpLdaKKuwn5ywrlx5DepX2ym8fzGJ1zPFvSe4X6zznA"
        "xuChNKRucn+d4B0fEX/xHt59gernjXoHxVRPS+qd4O9/gv4xUnrpIs/z9wt/fhP+IH1TC2cziBnxc+m9+sgPYocT8B9DOUPynOfr"
        "FvTyCr7DZKQPq/qskPyV87jQzhAvZfoeou9PoM9MSc5NkmMEPpmYwXvrKMV9HfHF+atNdWajwG5Lql6GhC8lf0jV+Zxap6xXM4gL"
        "eR8skJ2rqtevw3Ye5kuH8FXkbm+T770OHDMvA+7BKJfFy/WN+7PhENxyBj9tc9zT5Iee76fUuqf6fqn3MdmJ/bsFffo8+J2j8Sx6"
        "ly3ILv40inrIdbVCPvVnO9fRz1GeP/zZvdlBnGm7HDS5vJZynKHvFGKTz/x3SOdEVwFTJ59P6H3h8b44OvA7b5+uHeSolHoricsu"
        "6HwB3O/S+20MvYf32Y/cuAy+Nwq+d5mC75+1Ie/zdfUuLavzrspjiXo3CNwl9EcTWE+o77d7XZepzv1tcv8JsU7JPhY6Sijfbkc5"
        "PrHdHeJ3VL3bQ/U9Zg28eLzX6a3AfarUrnOoa015/5i8vv1u//vdKVT14Afqaw/hzfRvnQ7zfKi/P21SHvJ4bhP+AwXfn7kvyRQ/"
        "tuD7eLjDOzDaBf9us76n4zEewl9GdovU9zPZf8Tm8fhbBfnHAd39Os9BZ5o5zl9B98NW7jfLzsGnXILsubt3HcDWvhz3Sw5++5dK"
        "8Ie3+V82+Ac6yHiY"
    ),
    "15.1.0": (
        "eNqdWDtsXEUUfW/eb3ff7nrtxLtrO+u1rayd2HECJnGchMiJCWDFBlOQgKDgI35SEhkhQoFoAAkhBDSUFIgiSDTQpk0BTdogKoSC"
        "RHpKGmBGcy57cnlrI680mp2ZO/f/mxcEQXDMjtyO1I4JOxLMR+0w2I8C/zMYso4xtzFPYb4depgaRophCE/DjnewdrAhaMt5QvAx"
        "7bvfKOanMX+K+TvMc8AneObtyCAT44nUbAB3AHsJ/lfBwwb2Xwd8GXRyrPcT3SE7Hsb6NejhJO4bggthg2E7OjgXemPA63gqgb77"
        "fVBAl/kRfbawX1L2S3BeUfAJaImNRS8pzmuYM+I/IDli4jfagY+oYGZ8qbofE++p8pMUuqsQ/Yrym0H0U6XHmGbhp076yoGjpOB3"
        "07ump/Ue4yweoPec8JXpXGwlfCQqPtnPDc2izxr20gI8oYrDGnRRxVwU/8MkX6DwpSpvsP+zfjPSW0L6LaKXF+h1EN2E6CcFds8L"
        "5Dqu1mIjkXM/2YHh9kG2MeWPIm9J5dJM2asMHnPyE6f3M6DRIPlnC+ydYh5T+23gS9V+ifCJPbo4b5L+RtU9niPSZw/rUdKH7Ivs"
        "K8hnDu8W6M4Rvpj0dQT7T4b326+k+JD9ebWeCf7fPdHrabV/geK0BLkM/MDl+WcoL7r9a8avR4BnAnc3cV6FDVrA14KPjA7wQ9Ht"
        "JeU3Efmx+EuD7lWx/xzoHcHZ4/AxqdeSB2rYP0x+4vhaxLn0Bw7vQapX54BnEveqxE+V6qqj94CzI/aE3wr+X8d8CvA54JYovkUO"
        "sccQyXsI/1vm/jo1p+pWeQc/lj7GwS0PqJ8x7XM9lbpXBwzDvUX2ynAmeqpDxhnow6g+IVf0U9UfmQJ/FvtLPMeUCwXO5ZOf7OKs"
        "nZ+AH143Pvav2Av3cLdCsu4Up6eoltSRf7he7nWepn70TuhptileU/LXiOIxUn3J86SfmPLKC2THMuhJT9aF/jvkNw3an8V61RK6"
        "ZQVetf8/vxwEa8Dh6NdDj7+DXHhc1a+3EU/SF7yB+Tz1BDq/t1Q/KTHmeDwB3BLnkh/GCDaguOoBZhJna8gF4p+SJ1ZgkyGVd9q4"
        "dxF8SX0fJruUKf54LvIPscsQ8L+n+kShe2PB/2/jzMkTWeNthx7uCtWcnOp3Dfjqql4Oehdcgw6uhl6m8+DjJGJB8qfUAzevEt6P"
        "UQuK3lkV5GczQD/ivzPE94Tq+yPyyxA8TENvOWInR11rAP5N0Hyf7L4EnUheF911KV5irEOq82XSo6sdXyk79QhfBJiM/LRK/Bf1"
        "zTudO19dCft1tIzRor5qgfqwCwXvl0XVJ0s+k35pivJeBjzHlP7FRlInH0U+lD7I3X9Iweu+dpLsLTW/SfE3Dd3LvS7170PwR5E9"
        "xNs1Bj9N6G0LcbqMPFTFnEImqbu9sE93oeAdcRH+kCEHjoPuYcpzbdBch87En85Snajibkr+skz5MaJ3aY/s5vA8Ruccz4b0XqH+"
        "cxawCXgoDaib3F+neMfHxF+yh3dfoPr5UL2DEqqnJfVOcPc/Qf8YK710kOf5+4U7vwF/kL6pibNpxIz4ufRePeQHscMJ+E9IOUPy"
        "nOPrJvTyCr7D5KQPo/qsiPyV87jQzhEvZfoeou+Po8/MSM4NkmMYPpmG/ffWUYr7OuKL81eL6sx6gd0WVb2MCF9G/pCp81m1zliv"
        "YT8u5H0wT3auql6/Dts5mC8twleRu51NfnA6sMy8DLgHYy+Lk+tb+2fdIrhpDX7aeNxT5IeO76fUuqv6fqn3CdmJ/bsJfbo8+L2l"
        "8Sx6l03ILv40gnrIdbVCPvVny+vo59jnD3d2b6YfZ9ouB0Mvr6EcF9J3CrHJZ+47pHWiq4Cpk8+n9L5weF8c6fuds0/H9HNURr2V"
        "xGUHdL4A7nfp/TaK3sP57Ed2XAbf6wXfu8KC75+1Ae/zNfUuLavzjspjqXo3CNwl9EfjWI+r77d7XZepzv0dev+JsM7IPgY6Sinf"
        "bsUen9juDvE7ot7tkfoeswpeHN5teitwnyq16xzqWkPeP6Gvb7+b/353ilQ9+JH62kN4M/1bpyOfD/X3pw3KQw7PLcJ/oOD7M/cl"
        "ueLHFHwfj3Z4B8a74N9t1vd0PCYD+MvJbrH6fib7jxgfj79VkH8s0N1vfA460/A4fwXdD5veb5Y6/s62vfu1dbaune9awM19nsZL"
        "9t7WL5XgD2f7v0zwD/vueZc="
    ),
}


def non_word_ranges() -> list[tuple[int, int]]:
    """(first, last) code points of every run of code points that are not letters, marks or numbers."""
    return stored_non_word_ranges(unicodedata.unidata_version) or computed_non_word_ranges()


def stored_non_word_ranges(version: str) -> Optional[list[tuple[int, int]]]:
    """``non_word_ranges`` of that Unicode version, as stored (None if it is not)."""
    stored = STORED.get(version)
    if stored is None:
        return None
    deltas = zlib.decompress(base64.b64decode(stored))
    bounds = list(accumulate(struct.unpack(f"<{len(deltas) // 4}I", deltas)))
    return list(zip(bounds[0::2], bounds[1::2]))


def computed_non_word_ranges() -> list[tuple[int, int]]:
    """``non_word_ranges`` worked out from ``unicodedata``, code point by code point."""
    ranges: list[tuple[int, int]] = []
    start = None
    for cp in range(sys.maxunicode + 2):
        keep = cp <= sys.maxunicode and unicodedata.category(chr(cp))[0] in "LMN"
        if not keep and start is None:
            start = cp
        elif keep and start is not None:
            ranges.append((start, cp - 1))
            start = None
    if start is not None:
        ranges.append((start, sys.maxunicode))
    return ranges


def _encoded(ranges: list[tuple[int, int]]) -> str:
    bounds = [b for r in ranges for b in r]
    deltas = struct.pack(f"<{len(bounds)}I", *(b - a for a, b in zip([0, *bounds], bounds)))
    return base64.b64encode(zlib.compress(deltas, 9)).decode("ascii")


def _store(path: str = __file__) -> str:
    """Add (or renew) the running Python's Unicode version in this file's ``STORED``; returns the version."""
    version = unicodedata.unidata_version
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    entries = dict(STORED, **{version: _encoded(computed_non_word_ranges())})
    table = "".join(_entry(v, entries[v]) for v in sorted(entries, key=lambda v: tuple(map(int, v.split(".")))))
    source = re.sub(r"STORED = \{\n.*?\}\n", lambda _: "STORED = {\n" + table + "}\n", source, count=1, flags=re.S)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(source)
    return version


def _entry(version: str, coded: str) -> str:
    lines = "".join(f'        "{coded[i:i + 100]}"\n' for i in range(0, len(coded), 100))
    return f'    "{version}": (\n{lines}    ),\n'


if __name__ == "__main__":
    print(f"stored the non-word ranges of Unicode {_store()}")
